"""Android phones over Appium: the environment, the device layer and the emulator manager.

Needs the ``android`` extra (``pip install 'digirl-lite[android]'``); names load on use, and
Appium is imported only when a session is opened.
"""

from __future__ import annotations

from digirl_lite._lazy import lazy_exports

_NAMES = {
    "AndroidEnv": "env",
    "AndroidConfig": "device", "AppiumDevice": "device", "Adb": "device",
    "DeviceUnavailable": "device", "DeviceRefused": "device", "perform": "device",
    "adb_input_text_args": "device",
    "EmulatorConfig": "emulator", "EmulatorManager": "emulator",
    "SdkToolMissing": "emulator", "AndroidEnvFactory": "emulator",
}

__all__ = list(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
