"""kvcommon.variants: the one grammar `name:key=value[,key=value]`."""
import pytest
from hypothesis import given, strategies as st

from kvcommon.variants import PolicyVariant, base_name, format_variant


def test_parse_and_format():
    v = PolicyVariant.parse(" keyformer:noise=gaussian, tau=2,flag=true,r=0.5 ")
    assert v == PolicyVariant("keyformer", {"noise": "gaussian", "tau": 2, "flag": True, "r": 0.5})
    assert str(v) == "keyformer:flag=True,noise=gaussian,r=0.5,tau=2"
    assert PolicyVariant.parse(str(v)) == v
    assert str(PolicyVariant.parse("h2o")) == "h2o" and PolicyVariant.parse("h2o:").params == {} == PolicyVariant.parse("h2o:,").params


def test_positional_value_for_one_documented_parameter():
    assert PolicyVariant.parse("keyformer:0.5", positional="cache_ratio").params == {"cache_ratio": 0.5}
    assert PolicyVariant.parse("h2o:0.2,noise=x", positional="cache_ratio").params == {"cache_ratio": 0.2, "noise": "x"}
    with pytest.raises(ValueError, match="expected key=value"):
        PolicyVariant.parse("keyformer:0.5")


def test_stored_label_round_trip():
    v = PolicyVariant("keyformer", {"noise": "gaussian"})
    assert v.label == "keyformer(noise=gaussian)" and PolicyVariant("h2o").label == "h2o"
    assert PolicyVariant.from_label(v.label) == v and PolicyVariant.from_label("full") == PolicyVariant("full")
    with pytest.raises(ValueError, match="bad policy label"):
        PolicyVariant.from_label("keyformer(noise=x")


@pytest.mark.parametrize("text, message", [(":x=1", "empty policy name"), ("h2o:x", "expected key=value"),
                                           ("h2o:=1", "expected key=value"), ("h2o:a=1,a=2", "given twice")])
def test_errors(text, message):
    with pytest.raises(ValueError, match=message):
        PolicyVariant.parse(text)


def test_helpers_and_hash():
    assert base_name("keyformer(noise=gaussian)") == "keyformer" and base_name("h2o:0.2") == "h2o"
    assert format_variant("h2o", {"b": 1, "a": 2}) == "h2o:a=2,b=1"
    assert len({PolicyVariant("h2o", {"a": 1}), PolicyVariant("h2o", {"a": 1})}) == 1
    assert PolicyVariant("h2o", {"a": 1, "b": 2}).without("a") == PolicyVariant("h2o", {"b": 2})


@given(st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=5),
                       st.one_of(st.integers(-5, 5), st.text("xyz", min_size=1, max_size=4)), max_size=3))
def test_round_trip(params):
    v = PolicyVariant("keyformer", params)
    assert PolicyVariant.parse(str(v)) == v and PolicyVariant.from_label(v.label) == v


def test_read_takes_both_spellings():
    from kvcommon.variants import PolicyVariant as V
    assert V.read("keyformer:selection=official") == V.read("keyformer(selection=official)") == \
        V("keyformer", {"selection": "official"})
    assert V.read("h2o:recent_ratio=0.20").label == "h2o(recent_ratio=0.2)"    # the label a trace stores
    assert V.read("full") == V("full")


def test_split_variants_keeps_a_variants_commas():
    from kvcommon.variants import split_variants
    assert split_variants("full,keyformer:noise=gaussian,tau_init=2,h2o") == \
        ["full", "keyformer:noise=gaussian,tau_init=2", "h2o"]
    assert split_variants(["keyformer(budget_base=padded,pad_length=512)", "h2o:recent_ratio=0.2,window"]) == \
        ["keyformer(budget_base=padded,pad_length=512)", "h2o:recent_ratio=0.2", "window"]


def test_check_variant_lists_the_valid_keys_and_values():
    from kvcommon.variants import PolicyVariant as V, VariantParam, check_variant
    params = {"noise": VariantParam("noise", "gumbel", "str", ("gumbel", "none")),
              "pad_length": VariantParam("pad_length", 1920, "int"), "cache_ratio": VariantParam("cache_ratio", 0.5, "float")}
    reserved = {"cache_ratio": "give it with --cache-ratio"}
    assert check_variant(V.read("k:noise=none,pad_length=4"), params, reserved).params == {"noise": "none", "pad_length": 4}
    for text, message in (("k:colour=red", "policy k has no parameter 'colour'; its parameters: noise, pad_length"),
                          ("k:noise=loud", "policy k: noise must be one of gumbel, none, got 'loud'"),
                          ("k:pad_length=2.5", "policy k: pad_length must be an integer, got 2.5"),
                          ("k:cache_ratio=0.5", "not a variant parameter (give it with --cache-ratio)")):
        with pytest.raises(ValueError) as info:
            check_variant(V.read(text), params, reserved)
        assert message in str(info.value) and "\n" not in str(info.value)
