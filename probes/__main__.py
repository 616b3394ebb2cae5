import sys

# A stage process imports only what its probe needs: the controller's own imports (and zipfile
# for the plan) cost each stage tens of milliseconds in a large image.
if sys.argv[1:2] == ["stage"]:
    from _imagegate_probe.stage import main

    sys.exit(main(sys.argv[2:]))

from _imagegate_probe.controller import main

sys.exit(main())
