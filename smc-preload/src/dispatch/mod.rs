//! Layer 2, dispatch: what every interposed call does ([`ops`]), routed by the fd's object in
//! the table to the socket layer below.

pub mod ops;
