import sys

from _imagegate_probe.controller import main

sys.exit(main())
