"""`spekula serve` (being built)."""


def register(sub) -> None:
    pass
