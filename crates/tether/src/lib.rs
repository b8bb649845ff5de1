//! placeholder: see DESIGN.md
