import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--safetensors-copy", action="store", default=None,
                     help="path of the safetensors_copy tool (else $TANDEM_SAFETENSORS_COPY)")
    parser.addoption("--tandem-bin", action="store", default=None,
                     help="path of the tandem executable for the model parity tests (else $TANDEM_BIN)")
    parser.addoption("--require-tandem-debug", action="store_true", default=False,
                     help="fail (instead of skip) the model parity tests when `tandem debug` is missing")


@pytest.fixture(scope="session")
def tandem(request):
    """The tandem executable (--tandem-bin or $TANDEM_BIN); test_model_parity has its own, which can skip."""
    path = request.config.getoption("--tandem-bin") or os.environ.get("TANDEM_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"set TANDEM_BIN (or --tandem-bin) to the tandem executable (got {path!r})")
    return path
