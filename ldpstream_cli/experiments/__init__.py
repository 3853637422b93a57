"""``ldp experiment NAME``: experiments that reproduce the papers the project implements, and the
poisoning experiment, each writing ``config.json``, CSV files and PNG plots (matplotlib, Agg).

* ``longitudinal``: Arcolezi et al., EDBT 2023, §5 (LOLOHA) on its Syn data (:mod:`.longitudinal`);
* ``allomfree``: Arcolezi et al., DCN 2022, §5 (ALLOMFREE) on synthetic multidimensional data
  (:mod:`.allomfree`);
* ``numerical``: DCN 2022, Tables 1-2 and EDBT 2023, Figs. 1-2 under both calibrations (:mod:`.numerical`);
* ``calibration``: empirical MSE against the analytical variance of every protocol (:mod:`.calibration`);
* ``numeric``: the numeric mechanisms (Laplace, Duchi, PM, HM, SW, 1BitMean) against their papers' claims, on
  synthetic data and Adult (:mod:`.numeric`);
* ``heavy-hitters``: PEM (Wang, Li & Jha, TDSC 2021), pure-ldp's PEM, CMS and HCMS over a candidate list:
  precision, recall and MSE of the top-K vs ε and n on Zipf data and a real word list (:mod:`.heavy_hitters`);
* ``poisoning``: Cao, Jia & Gong's attacks and the defenses (:mod:`ldpstream_cli.experiment_poisoning`).

The shared machinery (seeded parallel repetitions, files, configuration, wall time) is :mod:`.runner`.
"""
from __future__ import annotations

import importlib

import typer

#: modules under ldpstream_cli/experiments/ with a ``register(group)``, in the order of ``ldp experiment --help``
EXPERIMENTS = ("longitudinal", "allomfree", "numerical", "calibration", "numeric", "heavy_hitters")


def register(app: typer.Typer) -> None:
    """Create the ``experiment`` command group and register every experiment in it."""
    from ..experiment_poisoning import register as register_poisoning

    group = typer.Typer(help="Experiments: tables, CSV files and plots of the library's behaviour, and "
                             "reproductions of the papers' evaluations.", no_args_is_help=True)
    app.add_typer(group, name="experiment")
    for name in EXPERIMENTS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            continue  # an experiment not written yet
        module.register(group)
    register_poisoning(group)
