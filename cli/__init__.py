"""The task layer: every task of `invoke` (in a checkout) and of the `bwstack` console script."""

from invoke import Collection, Task

from bwstack.cli import (
    advise_tasks,
    bench_tasks,
    clean_tasks,
    dev_tasks,
    image_tasks,
    node_tasks,
    pins_tasks,
    smoke_tasks,
    verify_tasks,
)

namespace = Collection()
for tasks_module in (
    dev_tasks,
    image_tasks,
    pins_tasks,
    verify_tasks,
    advise_tasks,
    smoke_tasks,
    bench_tasks,
    node_tasks,
    clean_tasks,
):
    for task_object in vars(tasks_module).values():
        if isinstance(task_object, Task):
            namespace.add_task(task_object)
