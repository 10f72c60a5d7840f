"""The runtime of one episode of a task directory: its built environment (`envs.terminal.task_image`) on the local
namespace sandbox or in a docker container, with the task's resources.

Local (`runtime=local`): a `RootfsRuntime` over the unpacked root; `storage_mb` caps what the episode may write. The
local sandbox has no cgroup of its own, so `cpus` and `memory_mb` are not enforced there (an address-space rlimit would
break runtimes that reserve more than they use); docker enforces both. Docker (`runtime=docker`): the same root
imported as an image, a container as the image's user (root by default) in its WORKDIR, with Docker's default
capabilities and background processes that outlive a command (as in the task's own container), no network, `cpus` and
`memory_mb` as cgroup limits, and `runtime_options` passed on (`docker_host`, ...). Its pid 1 is `sleep` itself (no
docker-init), so the exec wrapper's cleanup (`kill -9 -1`, which spares pid 1) cannot stop the container when the
agent is root.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.options import from_options
from envs.runtime.local import Limits
from envs.terminal.task_image import TASK_UID_BASE, build_task_environment, docker_image, local_root

DEFAULT_STORAGE_MB = 4096


def task_runtime(task: Mapping[str, Any], kind: str, options: Mapping[str, Any] | None,
                 base_images: Mapping[str, str] | None) -> Any:
    built = build_task_environment(task, base_images=base_images)
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
        return RootfsRuntime(RootfsConfig(lower=str(local_root(built)), uid_base=TASK_UID_BASE,
                                          workdir=built.workdir, user=user, env=env,
                                          storage_bytes=storage, limits=limits, **opts))
    if kind == "docker":
        from envs.runtime.docker import DOCKER_DEFAULT_CAPABILITIES, DockerConfig, DockerRuntime, docker_client

        client = docker_client(opts.get("docker_host"))
        try:
            tag = docker_image(client, built)
        except BaseException:
            client.close()
            raise
        config = {"image": tag, "workdir": built.workdir, "workdir_tmpfs": False, "read_only_rootfs": False,
                  "user": user, "env": env, "limits": limits,
                  # as under Docker: its default capabilities, setuid programs, daemons that outlive a command
                  "capabilities": list(DOCKER_DEFAULT_CAPABILITIES), "keep_background": True,
                  "no_new_privileges": False}
        if resources.get("cpus"):
            config["cpus"] = float(resources["cpus"])
        if resources.get("memory_mb"):
            config["memory_bytes"] = int(float(resources["memory_mb"]) * (1 << 20))
        config.update(opts)
        client.close()
        return DockerRuntime(from_options(DockerConfig, config, "docker runtime"), container_kwargs={"init": False})
    raise ValueError(f"runtime {kind!r}: a task directory runs on 'local' or 'docker'")

