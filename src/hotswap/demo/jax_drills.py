"""The elastic (seed 001) and migration (seed 004) drills with real multi-process JAX jobs:
``examples/train_jax.py`` (jax.distributed, gloo collectives on CPU, orbax checkpoints), the
same faults, checks and summary as the PyTorch drills. An elastic JAX job moves to a new
membership by restarting its surviving processes in place (``hotswap.train.jax.formation``),
so its MTTR includes starting a Python program with JAX and compiling the step again."""

from __future__ import annotations

from hotswap.demo.drills import Drill
from hotswap.demo.scenarios import ElasticDrill, HotswapDrill, MigrationDrill


class JaxHotswapDrill(HotswapDrill):
    framework = "jax"
    script = "train_jax.py"
    title = "a failed node moves the high-priority JAX job onto the low-priority job's slice"


class JaxElasticDrill(ElasticDrill):
    framework = "jax"
    script = "train_jax.py"
    title = "an elastic JAX job continues on 2 of 3 slices and grows back"


class JaxMigrationDrill(MigrationDrill):
    framework = "jax"
    script = "train_jax.py"
    title = "delete a JAX job mid-training and create it again: it resumes where it stopped"


JAX_DRILLS: dict[str, type[Drill]] = {
    "hotswap": JaxHotswapDrill, "elastic": JaxElasticDrill, "migration": JaxMigrationDrill,
}
