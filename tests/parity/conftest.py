def pytest_addoption(parser):
    parser.addoption("--safetensors-copy", action="store", default=None,
                     help="path of the safetensors_copy tool (else $TANDEM_SAFETENSORS_COPY)")
    parser.addoption("--tandem-bin", action="store", default=None,
                     help="path of the tandem executable for the model parity tests (else $TANDEM_BIN)")
    parser.addoption("--require-tandem-debug", action="store_true", default=False,
                     help="fail (instead of skip) the model parity tests when `tandem debug` is missing")
