"""Running a scenario as real processes (`runtime up`, `runtime profile`): the launcher, and
network namespaces with the scenario's links shaped."""
