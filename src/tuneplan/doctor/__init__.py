"""`tuneplan doctor`: inspect this machine and say what will run (detection behind a fakeable Probe)."""

from tuneplan.doctor.probe import Device, MachineInfo, Probe, StaticProbe
from tuneplan.doctor.report import DoctorReport, diagnose

__all__ = ["Device", "MachineInfo", "Probe", "StaticProbe", "DoctorReport", "diagnose", "SystemProbe"]


def __getattr__(name: str):  # the real probe imports subprocess/torch machinery only when asked
    if name == "SystemProbe":
        from tuneplan.doctor.system import SystemProbe

        return SystemProbe
    raise AttributeError(name)
