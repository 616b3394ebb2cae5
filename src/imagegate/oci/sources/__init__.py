"""One ImageSource interface (interface.py) and a module per transport."""
