"""`spekula bench | tune | audit` (being built)."""


def register(sub) -> None:
    pass
