"""Episodes on the farm: one episode (`runner`: observe -> policy -> env.step -> judge -> Step), many at once with
retries of aborted ones (`collect`), and the same spread over Ray runner actors (`pool`: RunnerPool, `loop.runners=N`)."""
