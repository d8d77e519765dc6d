"""What a run is told and what it reports: the scenario schema (strict, errors naming file, line
and field), units, the network and fault sections, expectations, and the run record
(metrics.json) that `sim run` and `runtime up` both write. The bottom of the runtime."""
