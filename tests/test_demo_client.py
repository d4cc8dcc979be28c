"""The demo client's command line: an API key is read as the key, whatever it begins with."""

import importlib.util
from pathlib import Path

import pytest

DEMO_CLIENT = Path(__file__).resolve().parent.parent / "scripts" / "demo_client.py"


@pytest.fixture(scope="module")
def demo_client():
    spec = importlib.util.spec_from_file_location("demo_client", DEMO_CLIENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", ["-abc", "--abc", "cs_-abc", "cs_abc"])
def test_token_given_with_equals_is_the_key(demo_client, key):
    assert demo_client.arguments([f"--token={key}"]).token == key


def test_demo_passes_the_token_with_equals():
    demo = (DEMO_CLIENT.parent / "demo.sh").read_text()

    assert '--token="$TOKEN"' in demo
    assert '--token "$TOKEN"' not in demo
