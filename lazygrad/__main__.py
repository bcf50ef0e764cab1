"""`python -m lazygrad`: every device, and whether it is available here (and why not)."""

from lazygrad.device import CORES, Device, describe_devices
from lazygrad.runtime.host_cpu import host_cpu

if __name__ == "__main__":
    for device_name, state in describe_devices():
        if state == "available" and hasattr(Device[device_name], "description"):
            state += f": {Device[device_name].description}"
        print(f"{device_name:8s} {state}")
    print(f"default: {Device.DEFAULT}")
    print(f"host code is generated for: {host_cpu().describe()}")
    print(f"cores: {CORES} (this process's; a host kernel with enough work shares its outer loop across them)")
