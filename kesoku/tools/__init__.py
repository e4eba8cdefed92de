"""Tools the model can call (DESIGN §8); :mod:`kesoku.tools.base` defines what a tool is."""
