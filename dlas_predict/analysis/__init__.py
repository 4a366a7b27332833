"""Analysis: ParaDnn-style frames, heat maps, regressions, rooflines and box plots over a
corpus (``frames``), and the DLAS report with its observations (``report``)."""
