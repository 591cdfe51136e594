//! Layer 2, dispatch: what every interposed call does ([`ops`]; across `fork`, `vfork`,
//! `exec` and `SCM_RIGHTS`: [`lifecycle`]), routed by the fd's object in
//! the table to the socket layer below.

pub mod lifecycle;
pub mod ops;
