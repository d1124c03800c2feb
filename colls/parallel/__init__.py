"""Training reference loops: the same small model trained serially and by every parallel strategy.

    from colls.parallel import Setup, train
    results = train("zero2", Setup(steps=4), nprocs=4, transport="shm")
"""
