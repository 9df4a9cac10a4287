"""hwmodels.skus: the accelerator names published tables print -> the shipped hardware file, or none with why."""
import pytest

from hwmodels import list_devices
from hwmodels import skus


@pytest.mark.parametrize("label, device", [
    ("H200-SXM-141GB", "h200-sxm"), ("H100-SXM-80GB (x2)", "h100-sxm"), ("H100 SXM5 80GB", "h100-sxm"),
    ("NVIDIA H100", "h100-sxm"), ("A100-SXM-80GB (assumed)", "a100-80g-sxm"), ("A100-SXM4-40GB", "a100-40g-sxm"),
    ("L40S-48GB", "l40s"), ("NVIDIA L4", "l4"), ("MI300X-192GB (x8)", "mi300x"), ("h200-sxm", "h200-sxm"),
    # the published energy and TRT-LLM rows' labels (../shared/data): Blackwell and Grace Hopper parts
    ("B200 (as published)", "b200"), ("GH200-120GB (as published)", "gh200"),
    ("GH200-96GB (published GH200 96GB HBM3 CG1)", "gh200"), ("GH200 (published GH200 480GB; gptManagerBenchmark)", "gh200"),
    ("GH200 144GB", "gh200-144g"), ("GH200 HBM3e", "gh200-144g"),
])
def test_published_names_map_to_their_part(label, device):
    assert skus.resolve_sku(label)[0] == device


@pytest.mark.parametrize("label, why", [
    ("H100 PCIe", "PCIe"), ("H100 NVL", "NVL"), ("H200 NVL", "PCIe card"), ("GB200 NVL72", "Blackwell"),
    ("A100 PCIe 80GB", "PCIe"), ("L40", "not L40S"), ("B100", "Blackwell"), ("Gaudi 3", "no hardware file"),
])
def test_variants_without_a_file_say_why(label, why):
    device, reason = skus.resolve_sku(label)
    assert device is None and why in reason and "\n" not in reason


def test_every_rule_names_a_shipped_file_or_none():
    rules = skus._rules()
    assert rules and all(device is None or device in list_devices() for _, device, _ in rules)


def test_load_device_accepts_published_names_and_says_why_not():
    from hwmodels import HardwareFileError, load_device
    assert load_device("H100 SXM5 80GB").name == load_device("h100-sxm").name
    with pytest.raises(HardwareFileError, match="PCIe"):
        load_device("H100 PCIe")
    assert skus.list_devices() == list_devices()
