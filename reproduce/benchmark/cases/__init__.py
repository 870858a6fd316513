"""One module per bench case, named as ``--cases`` names it (``window-as-met`` is ``window_as_met``)."""
