"""Making faults happen: the one schedule that fires them, runtime up's target (signals, the fault
proxy) and the proxy itself. What each fault is lives in `runtime.config.faults`."""
