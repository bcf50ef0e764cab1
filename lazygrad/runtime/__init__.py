"""One module per device: `ops_<name>.py` with an `open_device()` returning its `Compiled`."""
