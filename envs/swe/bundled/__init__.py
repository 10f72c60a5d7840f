"""Bundled SWE instances on small repositories written for NextState (sources here; see envs.swe.bundle)."""
