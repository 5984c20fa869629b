"""Train and read the shared-view arms (:mod:`looplab.studies.flat_cache_view.protocol`).

    python -m looplab.studies.flat_cache_view.run --out runs/flat-cache-view [--arms lognormal_view] [--seeds 7201]

The flat-cache study's runner on this protocol: each (arm, seed) trains into OUT/<arm>-<seed> (a killed run
resumes) and is read by the flat-cache study's reads into OUT/<arm>-<seed>/reads.csv; OUT/reads.csv gathers
them, the file the page reads.
"""

from looplab.studies.flat_cache import run
from looplab.studies.flat_cache_view import protocol

if __name__ == "__main__":
    run.main(protocol, "flat-cache-view", __doc__.splitlines()[0])
