"""schemathesis against the server's own OpenAPI document: generated requests (valid and invalid) for every
endpoint must get no 5xx and no response outside what the document promises (status, content type, schema)."""
import os

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from serving import Server, make_tiny_folder  # noqa: E402

EXAMPLES = int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", "200"))  # per endpoint; the slow test runs more


@pytest.fixture(scope="module", autouse=True)
def subnormal_floats():
    """Hypothesis generates floats down to the subnormals, which it refuses to do while denormals flush to zero
    (attnlab sets that for speed in this process); only HTTP runs here, so they are allowed for this module."""
    import torch

    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(True)


@pytest.fixture(scope="module")
def api(tmp_path_factory, subnormal_floats):
    folder = make_tiny_folder(tmp_path_factory.mktemp("tiny"), context=256,
                              chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    # a small cap keeps every accepted request short, so the run is about the inputs, not the decoding
    with Server(folder, "--max-tokens-cap", "16", "--max-queue", "64", "--request-timeout", "30") as s:
        yield schemathesis.openapi.from_url(s.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_endpoint_keeps_its_documented_contract(case):
    _call(case)


def _call(case):
    """Call and check everything, except in the three places where a schema-valid request is rightly refused, each
    allowed only with its own error code: a text prompt longer than the context in tokens (a limit no string length
    states); /api/predict's one rule across parameters (cached_tokens <= prompt_tokens); and an integer sent as
    a float such as 83.0, which JSON Schema counts as an integer and this server's strict types refuse by design."""
    from schemathesis.checks import positive_data_acceptance

    response = case.call()
    code = None
    if response.status_code == 400:
        code = response.json()["error"]["code"]
    path = case.operation.path
    legit = ((code == "context_length" and path.startswith("/v1/"))
             or (code == "invalid_value" and path == "/api/predict" and _over_cached(case.query or {}))
             or (code == "invalid_type" and _integral_float(case.body)))
    case.validate_response(response, excluded_checks=[positive_data_acceptance] if legit else [])


def _integral_float(obj) -> bool:
    if isinstance(obj, float):
        return obj.is_integer()
    if isinstance(obj, dict):
        return any(map(_integral_float, obj.values()))
    if isinstance(obj, list):
        return any(map(_integral_float, obj))
    return False


def _over_cached(query: dict) -> bool:
    try:
        return int(query.get("cached_tokens", 0)) > int(query["prompt_tokens"])
    except (KeyError, TypeError, ValueError):
        return False


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=10 * EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_endpoint_keeps_its_documented_contract_long(case):
    _call(case)
