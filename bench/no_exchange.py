"""A collective that moves nothing: what N replicas' steps cost without the all-reduce.

`bin/predict_scaling --against=measured` checks the cost model's claims
about communication on this machine's logical CPU devices. Those replicas
share the host's cores, and how much two or four of them get done at once
depends on the model (a small MLP's steps overlap, a convolution's stream
memory and barely do), so a prediction from ONE replica's step has to guess
that sharing, and on a GPU cluster, where each replica has a device of its
own, there is nothing of the kind to guess. This collective takes the
guess away: each replica keeps its own gradient (no copy, no sum), so
`bin/bench_train --collective=tfloop.bench.no_exchange:NoExchange` times
the N-replica step with every cost of the run but the exchange. The
prediction adds the all-reduce the α–β fit predicts to it; what is checked
is then the fit, and the step model's claim that the engine's one
all-reduce does not overlap the compute.

For timing only: the replicas' weights drift apart (each applies its own
gradient), which is exactly what a real collective exists to prevent.
"""

from __future__ import annotations

from tfloop import collectives

#: `--collective=` for this class (bin/bench_train, scaling_check).
NAME = f"{__name__}:NoExchange"


class NoExchange(collectives.Collective):
    """Each replica's gradient, as it is, on its own device: no bytes move."""

    def _sum_replicas(self, values, destinations):
        return [collectives.mirrored(list(collectives.components(value))) for value in values]
