"""The demo's data plane: FLIP-276's purchase generator and the probes that read its join at
each level (the demo's orchestration is ``lockstep.demo``)."""
