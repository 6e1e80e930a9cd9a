//! The Bf-Tree. This release holds its shared page layout, [`node`], and the first
//! building blocks of the tree operations: the optimistic version lock of inner nodes and
//! the mapping table.

mod mapping;
pub mod node;
mod olc;
