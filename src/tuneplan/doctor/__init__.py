"""`tuneplan doctor`: inspect this machine and say what will run (detection behind a fakeable Detector)."""

from tuneplan.doctor.machine import Detector, Device, MachineInfo, StaticDetector
from tuneplan.doctor.report import DoctorReport, diagnose

__all__ = ["Device", "MachineInfo", "Detector", "StaticDetector", "DoctorReport", "diagnose",
           "SystemDetector"]


def __getattr__(name: str):  # the real detector imports subprocess/torch machinery only when asked
    if name == "SystemDetector":
        from tuneplan.doctor.system import SystemDetector

        return SystemDetector
    raise AttributeError(name)
