"""``tfps compose``: placeholder until the compose generator lands."""


def add_arguments(parser) -> None:
    parser.add_argument("-o", "--output", default="-")


def main(ns) -> int:
    raise SystemExit("tfps compose is not implemented yet")
