"""crossrt beyond one host, through the serving systems users already run (docs/scale-out.md):
``scaleout.ray`` puts crossrt runtimes in Ray Serve replicas. It sits above ``server`` (it
serves the daemon's KServe v2 service and REST routes) and below ``tools`` (``crossrt
deploy``)."""
