"""Tools the model can call; :mod:`kesoku.tools.base` defines what a tool is."""
