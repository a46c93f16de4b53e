"""Data shipped with multibackend: the calibration tables of untuned ``auto``
(:mod:`multibackend.choose.calibration`)."""
