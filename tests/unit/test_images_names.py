"""Image pinning policy and Kubernetes names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_ray.core.errors import ConfigError
from miles_ray.core.images import check_image, parse_image
from miles_ray.core.names import DNS1035, check_cluster_name, label_safe

HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize("ref", [
    f"radixark/miles@sha256:{HEX}",
    f"radixark/miles:latest@sha256:{HEX}",
    f"registry.example.com:5000/team/miles:dev-2026@sha256:{HEX}",
    f"localhost/miles@sha256:{HEX}",
])
def test_pinned_references_accepted(ref: str) -> None:
    image, warnings = check_image(ref)
    assert image.pinned and not warnings and str(image) == ref


def test_tag_only_refused_with_explanation_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="not pinned by digest") as info:
        check_image("radixark/miles:latest")
    assert "sha256" in str(info.value) and "--allow-unpinned" in str(info.value)
    image, warnings = check_image("radixark/miles:latest", allow_unpinned=True)
    assert not image.pinned and warnings


@pytest.mark.parametrize("ref", [
    "radixark/miles@sha256:abc",
    f"radixark/miles@sha256:{HEX.upper()}",
    f"radixark/miles@sha512:{HEX}",
    f"radixark/miles@sha256:{HEX}0",
])
def test_malformed_digest(ref: str) -> None:
    with pytest.raises(ConfigError, match="malformed digest"):
        parse_image(ref)


@pytest.mark.parametrize("ref", ["", "UPPER/case@sha256:" + HEX, "a b", "miles:", ":tag", "x" * 600])
def test_invalid_reference(ref: str) -> None:
    with pytest.raises(ConfigError):
        parse_image(ref)


@given(st.text(max_size=80))
def test_any_text_either_parses_or_raises_config_error(text: str) -> None:
    try:
        parse_image(text)
    except ConfigError as e:
        assert "\n" not in str(e)


def test_cluster_names() -> None:
    assert check_cluster_name("miles-qwen3") == "miles-qwen3"
    for bad in ["", "Miles", "1miles", "miles-", "mi_les", "a" * 54]:
        with pytest.raises(ConfigError):
            check_cluster_name(bad)
    assert check_cluster_name("a" * 53)


@given(st.text(max_size=120))
def test_label_safe_always_valid(text: str) -> None:
    v = label_safe(text)
    assert len(v) <= 63
    assert v == "" or (v[0].isalnum() and v[-1].isalnum())


@given(st.from_regex(DNS1035, fullmatch=True).filter(lambda s: len(s) <= 53))
def test_every_dns1035_label_up_to_53_is_accepted(name: str) -> None:
    assert check_cluster_name(name) == name
