"""A component's read-only view of what one of its parts owns.

A component built from parts (the engine from its cache, writer and loop; the elected
committer from its routes) shows some of their values as its own. Each stays owned by the part
that sets it: the component only reads it, under the same name.
"""

from __future__ import annotations

from typing import Generic, TypeVar, cast, overload

V = TypeVar("V")


class Forwarded(Generic[V]):
    """A read-only attribute whose value is the same-named attribute of the part held in
    ``part``.

    >>> class Box:
    ...     size = 3
    >>> class Crate:
    ...     size = Forwarded[int]("_box", "How much the box holds.")
    ...     def __init__(self) -> None:
    ...         self._box = Box()
    >>> Crate().size
    3
    """

    def __init__(self, part: str, doc: str) -> None:
        self.part = part
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, holder: None, owner: type) -> Forwarded[V]: ...

    @overload
    def __get__(self, holder: object, owner: type | None = None) -> V: ...

    def __get__(self, holder: object, owner: type | None = None) -> Forwarded[V] | V:
        if holder is None:
            return self
        # Typed by the declaration: the part's attribute of this name.
        return cast(V, getattr(getattr(holder, self.part), self.name))

    def __set__(self, holder: object, value: V) -> None:
        # As a property without a setter: the part is the one owner that changes it.
        raise AttributeError(f"{self.name!r} is read-only here: {self.part} owns it")
