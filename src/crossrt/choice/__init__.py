"""Device choice: ``crossrt.compile``, which compiles for the device named or, with
``device="auto"``, measures every engine and keeps the fastest whose outputs match the oracle.

It sits above the runtime (it loads candidates to time them) and below the tools, as
OpenVINO's AUTO is a device plugin over the others rather than a part of the runtime:
``auto.py`` (the choice), ``probe.py`` (probe inputs, tolerances, timing), ``oracle.py`` (what
the candidates and ``crossrt verify`` are checked against), ``decision.py`` (the candidate kept,
and the record of why). ``docs/auto.md``.
"""

from .auto import AUTO, TOLERANCES, compile

__all__ = ["AUTO", "TOLERANCES", "compile"]
