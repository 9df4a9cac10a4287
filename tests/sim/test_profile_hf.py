"""The `hf` profile's SDPA decode rate: a grouped-query model pays its query heads on devices whose file
measured SDPA's decode kernel (hwmodels sdpa_decode_efficiency); other devices and phases are unchanged."""
import numpy as np
import pytest
import yaml

from hwmodels import DEVICES_DIR
from sim.engine import decode_step_time, prefill_time
from sim.models import ModelSpec

GQA = ModelSpec(name="gqa-test", model_type="llama", n_layers=4, d_model=1024, n_heads=16, n_kv_heads=4,
                head_dim=64, d_ff=2816, vocab_size=32000, gated_mlp=True, tied_embeddings=False,
                positional="rope", max_positions=8192, source="test")
MHA = ModelSpec(name="mha-test", model_type="llama", n_layers=4, d_model=1024, n_heads=16, n_kv_heads=16,
                head_dim=64, d_ff=2816, vocab_size=32000, gated_mlp=True, tied_embeddings=False,
                positional="rope", max_positions=8192, source="test")


def cpu_file(tmp_path, sdpa=None):
    data = yaml.safe_load((DEVICES_DIR / "cpu-local.yaml").read_text())
    data["name"] = "sdpa-test" if sdpa else "no-sdpa-test"
    data.pop("sdpa_decode_efficiency", None)
    if sdpa:
        data["sdpa_decode_efficiency"] = {"form": "table", "size_unit": "head_dim", "source": "test", "points": sdpa}
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_grouped_query_decode_pays_its_query_heads_at_the_sdpa_rate(tmp_path):
    slow = 0.01                                      # SDPA's per-(query head, key) rate, fraction of fp32 peak
    plain, sdpa = cpu_file(tmp_path), cpu_file(tmp_path, [[64, slow], [128, slow]])
    kv = np.full(2, 3000.0)
    base = decode_step_time(plain, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="hf")
    with_rate = decode_step_time(sdpa, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="hf")
    from hwmodels import load_device
    peak = load_device(sdpa).peak_flops("fp32")
    # per layer, at least every query head over every key at that rate (attention's own compute)
    floor = GQA.n_layers * 2 * GQA.n_heads * 3001 * (4 * 64 + 5) / (peak * slow)
    assert with_rate > base and with_rate - base >= 0.5 * floor
    # the fused engines never read the table; prefill keeps its own path
    assert decode_step_time(sdpa, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="fused") == \
        pytest.approx(decode_step_time(plain, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="fused"))
    assert prefill_time(sdpa, GQA, [(512, 0)], weight_dtype="fp32", kv_dtype="fp32", profile="hf") == \
        pytest.approx(prefill_time(plain, GQA, [(512, 0)], weight_dtype="fp32", kv_dtype="fp32", profile="hf"))


def test_a_multi_head_model_at_a_fast_sdpa_rate_stays_bandwidth_bound(tmp_path):
    plain, sdpa = cpu_file(tmp_path), cpu_file(tmp_path, [[64, 0.5], [128, 0.5]])
    kv = np.full(4, 3000.0)
    assert decode_step_time(sdpa, MHA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="hf") == pytest.approx(
        decode_step_time(plain, MHA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="hf"), rel=1e-9)


def test_hf_fit_terms_apply_on_their_own_hardware_file_only(tmp_path):
    from hwmodels import load_device
    from sim.profiles import hf_fit
    path = cpu_file(tmp_path)
    device = load_device(path)
    kv = np.full(2, 1000.0)
    hf = decode_step_time(path, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile="hf")
    own = hf_fit.make_profile({"stream_fraction": 0.8}, device.content_hash, name="hf-fit-test")
    other = hf_fit.make_profile({"stream_fraction": 0.8}, "0" * 16, name="hf-fit-other")
    slower = decode_step_time(path, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile=own)
    assert slower > hf * 1.1                                     # slower streams
    assert decode_step_time(path, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile=other) == pytest.approx(hf)
    neutral = hf_fit.make_profile({"stream_fraction": 1.0}, device.content_hash, name="hf-fit-1")
    assert decode_step_time(path, GQA, kv, weight_dtype="fp32", kv_dtype="fp32", profile=neutral) == pytest.approx(hf)
    with pytest.raises(ValueError, match="outside its bounds"):
        hf_fit.make_profile({"stream_fraction": 1.2}, device.content_hash)
