"""In-image side of imagegate: the controller and the probes.

Standard library only, Python >= 3.8 (linted as 3.8 code; the oldest the suite runs them on is
3.9, in a Debian 11 image, since no reachable registry provides a 3.8):
this code runs with the image's own interpreter in images we do not control. Modules under test
are imported inside probe functions, never at top level.
Bundled into one zipapp as the package `_imagegate_probe`.
"""
