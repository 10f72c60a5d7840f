"""The runtime of one episode of a task directory: its built environment (`envs.terminal.task_image`) on the local
namespace sandbox or in a docker container, with the task's resources; and what its verifier needs (`TaskImage`).

Local (`runtime=local`): a `RootfsRuntime` over the unpacked root; `storage_mb` caps what the episode may write. The
local sandbox has no cgroup of its own, so `cpus` and `memory_mb` are not enforced there (an address-space rlimit would
break runtimes that reserve more than they use); docker enforces both. Docker (`runtime=docker`): the same root
imported as an image, a container as the image's user (root by default) in its WORKDIR, with Docker's default
capabilities and background processes that outlive a command (as in the task's own container), no network, `cpus` and
`memory_mb` as cgroup limits. Its pid 1 is `sleep` itself (no docker-init), so the exec wrapper's cleanup (`kill -9
-1`, which spares pid 1) cannot stop the container when the agent is root. `runtime_options` may narrow the container
(limits, fewer capabilities, `no_new_privileges`) and name the engine (`docker_host`), never widen it: host network,
more capabilities, another image or user are refused with an error naming the option (`DOCKER_TASK_OPTIONS`); there
is no option for devices, volumes, privileged mode or host namespaces at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.options import check_known, from_options
from envs.runtime.local import Limits
from envs.terminal.task_image import TASK_UID_BASE, build_task_environment, docker_image, local_root, task_cache_dir
from envs.terminal.test_runner import ensure_runner, image_interpreter
from envs.terminal.verifier import TaskImage

DEFAULT_STORAGE_MB = 4096
#: what `runtime_options` may set for a task directory's container (each only ever narrows it)
DOCKER_TASK_OPTIONS = ("docker_host", "limits", "cpus", "memory_bytes", "pids", "capabilities", "no_new_privileges",
                       "keep_background", "network")


def task_runtime(task: Mapping[str, Any], kind: str, options: Mapping[str, Any] | None,
                 base_images: Mapping[str, str] | None) -> tuple[Any, TaskImage]:
    built = build_task_environment(task, base_images=base_images)
    root = local_root(built)  # the local sandbox's lower layer; on both backends, where the verifier's Python is
    interpreter = image_interpreter(root, built.env.get("PATH", ""))
    image = TaskImage(root=root, interpreter=interpreter, runner=ensure_runner(task_cache_dir(), interpreter.version),
                      workdir=built.workdir, env=dict(built.env))
    resources = task.get("resources") or {}
    opts = dict(options or {})
    limits = opts.pop("limits", {}) or {}
    limits = limits if isinstance(limits, Limits) else from_options(Limits, dict(limits), "runtime_options.limits")
    user = built.uid_gid
    env = {"HOME": built.home, **built.env}
    if kind == "local":
        from envs.runtime.rootfs_runtime import RootfsConfig, RootfsRuntime

        unknown = set(opts) - {"hostname"}
        if unknown:
            raise ValueError(f"runtime_options {sorted(unknown)} do not apply to a task directory's local sandbox "
                             "(it takes hostname and limits)")
        storage = int(resources.get("storage_mb") or DEFAULT_STORAGE_MB) << 20
        return RootfsRuntime(RootfsConfig(lower=str(root), uid_base=TASK_UID_BASE, workdir=built.workdir, user=user,
                                          env=env, storage_bytes=storage, limits=limits, **opts)), image
    if kind == "docker":
        from envs.runtime.docker import DockerConfig, DockerRuntime, docker_client

        check_docker_options(opts)
        client = docker_client(opts.get("docker_host"))
        try:
            tag = docker_image(client, built)
        finally:
            client.close()
        config = task_container_config(tag, built.workdir, user, env, limits, resources)
        config.update(opts)
        return DockerRuntime(from_options(DockerConfig, config, "docker runtime"),
                             container_kwargs={"init": False}), image
    raise ValueError(f"runtime {kind!r}: a task directory runs on 'local' or 'docker'")


def task_container_config(tag: str, workdir: str, user: str, env: dict[str, str], limits: Limits,
                          resources: Mapping[str, Any]) -> dict[str, Any]:
    from envs.runtime.docker import DOCKER_DEFAULT_CAPABILITIES

    config: dict[str, Any] = {
        "image": tag, "workdir": workdir, "workdir_tmpfs": False, "read_only_rootfs": False, "user": user,
        "env": env, "limits": limits,
        # as under Docker: its default capabilities, setuid programs, daemons that outlive a command
        "capabilities": list(DOCKER_DEFAULT_CAPABILITIES), "keep_background": True, "no_new_privileges": False}
    if resources.get("cpus"):
        config["cpus"] = float(resources["cpus"])
    if resources.get("memory_mb"):
        config["memory_bytes"] = int(float(resources["memory_mb"]) * (1 << 20))
    return config


def check_docker_options(opts: Mapping[str, Any]) -> None:
    """Refuse `runtime_options` that would widen a task directory's container, naming the option and why."""
    from envs.runtime.docker import DOCKER_DEFAULT_CAPABILITIES

    widening = {"network_mode", "privileged", "cap_add", "devices", "volumes", "mounts", "binds", "pid_mode",
                "ipc_mode", "userns_mode", "security_opt", "image", "user", "read_only_rootfs", "workdir"}
    asked = sorted(set(opts) & widening)
    if asked:
        raise ValueError(f"runtime_options {asked} cannot be set for a task directory's container: it runs the "
                         f"task's own image, as its user, with nothing of the host's; it takes "
                         f"{', '.join(DOCKER_TASK_OPTIONS)}, each only to narrow it")
    check_known(DOCKER_TASK_OPTIONS, opts, "task directory docker runtime")
    if opts.get("network"):
        raise ValueError("runtime_options network=true would give a task directory's container the host's network; "
                         "its agent and its tests run offline")
    extra = sorted({str(c).upper() for c in opts.get("capabilities") or []} - set(DOCKER_DEFAULT_CAPABILITIES))
    if extra:
        raise ValueError(f"runtime_options capabilities {extra} go beyond Docker's defaults, which a task "
                         "directory's container already has at most")
