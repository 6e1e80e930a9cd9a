//! The Bf-Tree. This release holds only its shared page layout, [`node`].

pub mod node;
