"""In-image side of imagegate: the controller and the probes.

Standard library only, Python >= 3.9 (the oldest the suite runs them on, in a Debian 11 image):
this code runs with the image's own interpreter in images we do not control. Modules under test
are imported inside probe functions, never at top level.
Bundled into one zipapp as the package `_imagegate_probe`.
"""
