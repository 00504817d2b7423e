"""The miles-ray command line: parse, call the core and adapters, print. Heavy libraries (ray,
polyaxon, kubernetes) are imported only inside the commands that need them."""

from __future__ import annotations

import sys

import typer

from miles_ray.cli import (check_data, comm_check, compare, doctor, down, init, logs, plan, recipes, register, render,
                           runs, scale, status, stop, submit, up)
from miles_ray.core.errors import MilesRayError

app = typer.Typer(
    name="miles-ray",
    help=(
        "Take Miles RL post-training from one 8-GPU node to many on Ray/KubeRay.\n\n"
        "Start with 'plan' (is the trainer/rollout GPU split valid for the recipe?) and 'render' (the Polyaxon "
        "raycluster operation or KubeRay RayCluster: one pinned image and the same mounts on head and workers). "
        "'up' makes the cluster and waits until every GPU worker has joined Ray; 'submit' runs Miles on it with "
        "MILES_SCRIPT_EXTERNAL_RAY=1; 'scale', 'status', 'logs', 'stop', 'runs', 'down' do the rest. "
        "Try it with no cluster: 'miles-ray up --backend local --nodes 4', 'miles-ray submit --rehearse --nodes 2'."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("plan")(plan.plan_cmd)
app.command("up")(up.up_cmd)
app.command("submit")(submit.submit_cmd)
app.command("status")(status.status_cmd)
app.command("scale")(scale.scale_cmd)
app.command("logs")(logs.logs_cmd)
app.command("stop")(stop.stop_cmd)
app.add_typer(runs.runs_app, name="runs")
runs.runs_app.command("compare")(compare.compare_cmd)
app.command("check-data")(check_data.check_data_cmd)
app.command("doctor")(doctor.doctor_cmd)
app.command("comm-check")(comm_check.comm_check_cmd)
app.command("register")(register.register_cmd)
app.command("down")(down.down_cmd)
app.command("render")(render.render_cmd)
app.command("recipes")(recipes.recipes_cmd)
app.command("init")(init.init_cmd)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"miles-ray {version('miles-ray')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure becomes one line on stderr and an exit code, never a traceback."""
    try:  # Typer >= 0.22 vendors its own click
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover - older Typer on real click
        from click import exceptions as click  # type: ignore[no-redef]

    try:
        rv = app(args=argv, prog_name="miles-ray", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except MilesRayError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except click.NoArgsIsHelpError as e:
        # 'miles-ray' or 'miles-ray <group>' alone prints help (exit 0 for the top level, like git)
        print(e.ctx.get_help() if e.ctx else "", file=sys.stdout)
        return 0
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "miles-ray"
        print(f"error: {e.format_message()} (see '{cmd} --help')", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    except click.ClickException as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
