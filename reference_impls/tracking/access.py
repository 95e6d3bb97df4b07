"""Access control: users, tokens, project roles, and the permission each operation needs.

Roles are project-scoped and ordered; each grants what the ones before it grant:

=========  ==============================================================
viewer     **see**: list and search runs, read params, metrics, tags, lineage,
           artifact names and sizes
reader     **download**: also fetch artifact bytes (weights, datasets)
writer     **write**: also create runs, log metrics and artifacts, add lineage
owner      **manage**: also grant and revoke roles in the project
=========  ==============================================================

Seeing a run and downloading its weights are separate permissions on purpose: a viewer can
compare experiments without being able to take the models. An admin user may do anything.
Tokens are random 256-bit strings shown once; only their sha256 is stored.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update

from reference_impls.tracking.errors import NotFoundError, PermissionDeniedError, TrackingError
from reference_impls.tracking.metadata import PROJECT_RE, MetadataStore, _insert
from reference_impls.tracking.schema import Membership, Project, Token, User

__all__ = ["Permission", "Role", "UserInfo", "Access"]


class Permission(enum.StrEnum):
    SEE = "see"
    DOWNLOAD = "download"
    WRITE = "write"
    MANAGE = "manage"


class Role(enum.StrEnum):
    """Project roles, weakest first (see the module docstring)."""

    VIEWER = "viewer"
    READER = "reader"
    WRITER = "writer"
    OWNER = "owner"


_GRANTS = {
    Role.VIEWER: {Permission.SEE},
    Role.READER: {Permission.SEE, Permission.DOWNLOAD},
    Role.WRITER: {Permission.SEE, Permission.DOWNLOAD, Permission.WRITE},
    Role.OWNER: set(Permission),
}


@dataclass(frozen=True)
class UserInfo:
    id: int
    name: str
    is_admin: bool


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Access:
    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta

    def create_user(self, name: str, *, admin: bool = False) -> UserInfo:
        if not isinstance(name, str) or not PROJECT_RE.fullmatch(name) or len(name) > 100:
            raise TrackingError(f"invalid user name {name!r}: 1-100 letters, digits, '_.-'")
        with self.meta.engine.begin() as conn:
            if conn.scalar(select(User.id).where(User.name == name)) is not None:
                raise TrackingError(f"user {name!r} exists already")
            uid = conn.execute(
                insert(User).values(name=name, is_admin=admin, created_at=time.time())
            ).inserted_primary_key[0]  # type: ignore[index]
        return UserInfo(int(uid), name, admin)

    def user(self, name: str) -> UserInfo:
        with self.meta.read_engine.connect() as conn:
            row = conn.execute(
                select(User.id, User.name, User.is_admin).where(User.name == name)
            ).first()
        if row is None:
            raise NotFoundError(f"no user named {name!r}")
        return UserInfo(row.id, row.name, bool(row.is_admin))

    def create_token(self, user: str) -> str:
        info = self.user(user)
        token = "trk_" + secrets.token_urlsafe(32)
        with self.meta.engine.begin() as conn:
            conn.execute(
                insert(Token).values(
                    token_hash=_hash(token), user_id=info.id, created_at=time.time(), revoked=False
                )
            )
        return token

    def revoke_token(self, token: str) -> None:
        with self.meta.engine.begin() as conn:
            n = conn.execute(
                update(Token).where(Token.token_hash == _hash(token)).values(revoked=True)
            ).rowcount
        if not n:
            raise NotFoundError("no such token")

    def authenticate(self, token: str | None) -> UserInfo:
        if not token:
            raise PermissionDeniedError(
                "no token: send 'Authorization: Bearer <token>' (create one with "
                "`python -m reference_impls.tracking token create USER`)"
            )
        with self.meta.read_engine.connect() as conn:
            row = conn.execute(
                select(User.id, User.name, User.is_admin, Token.revoked)
                .join(Token, Token.user_id == User.id)
                .where(Token.token_hash == _hash(token))
            ).first()
        if row is None or row.revoked:
            raise PermissionDeniedError("unknown or revoked token")
        return UserInfo(row.id, row.name, bool(row.is_admin))

    def grant(self, user: str, project: str, role: Role | str) -> None:
        role = Role(role)
        info = self.user(user)
        pid = self.meta.project_id(project)
        stmt = _insert(self.meta.engine, Membership).values(
            user_id=info.id, project_id=pid, role=role.value
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["user_id", "project_id"], set_={"role": role.value}
        )
        with self.meta.engine.begin() as conn:
            conn.execute(stmt)

    def revoke(self, user: str, project: str) -> None:
        info = self.user(user)
        pid = self.meta.project_id(project, create=False)
        with self.meta.engine.begin() as conn:
            conn.execute(
                delete(Membership).where(
                    Membership.user_id == info.id, Membership.project_id == pid
                )
            )

    def role(self, user: UserInfo, project: str) -> Role | None:
        with self.meta.read_engine.connect() as conn:
            r = conn.scalar(
                select(Membership.role)
                .join(Project, Project.id == Membership.project_id)
                .where(Membership.user_id == user.id, Project.name == project)
            )
        return None if r is None else Role(r)

    def allowed(self, user: UserInfo, project: str, perm: Permission) -> bool:
        if user.is_admin:
            return True
        role = self.role(user, project)
        return role is not None and perm in _GRANTS[role]

    def require(self, user: UserInfo, project: str, perm: Permission) -> None:
        if not self.allowed(user, project, perm):
            role = self.role(user, project)
            need = next(r for r in Role if perm in _GRANTS[r])
            raise PermissionDeniedError(
                f"user {user.name!r} may not {perm.value} in project {project!r} "
                f"(role: {role.value if role else 'none'}; needs {need.value} or higher)"
            )

    def visible_projects(self, user: UserInfo) -> list[str]:
        if user.is_admin:
            return self.meta.projects()
        with self.meta.read_engine.connect() as conn:
            return sorted(
                conn.scalars(
                    select(Project.name)
                    .join(Membership, Membership.project_id == Project.id)
                    .where(Membership.user_id == user.id)
                )
            )
