def pytest_addoption(parser):
    parser.addoption("--safetensors-copy", action="store", default=None,
                     help="path of the safetensors_copy tool (else $TANDEM_SAFETENSORS_COPY)")
