"""What several test files share."""

import pytest

from lazygrad import Device
from lazygrad.device import DeviceUnavailable


def available(name: str) -> str:
    """The device's name, or a skip of the test saying why the device cannot run here."""
    try:
        Device[name]
    except (DeviceUnavailable, ImportError) as error:
        pytest.skip(str(error))
    return name
