//! A tree's leaf pages in memory, and their size.
//!
//! A leaf page is one node (the shared layout, kind `Leaf`) of [`LeafGeometry::node_bytes`]
//! bytes, kept by the page store in [`LeafGeometry::pages`] consecutive 4 KiB store
//! pages from the leaf's page number: the node's bytes are the payloads of those pages,
//! in order, each page with its own header and checksum. A tree of 4 KiB leaf pages (the
//! default) has one store page per leaf and its node is that page's payload, with no
//! copy; a keyspace whose keys are too long for that has leaves of 2, 4 or 8 pages
//! (`Config::leaf_page_size_bytes`), read and written together (one `read_pages` /
//! `write_pages` call, in flight together on io_uring), whose node is gathered from
//! the pages after a read and scattered into them before a write.
//!
//! A wide leaf's pages are written together but not atomically. That is safe because
//! nothing relies on a leaf whose write may have been torn: a reader without the page
//! lock validates its read against the leaf-write counter (`leaf_io`), a crash leaves
//! the pages of every kept checkpoint untouched (the shadow store writes a pinned page
//! elsewhere), and a torn page fails its own checksum.

use crate::storage::{PAGE_PAYLOAD_SIZE, PAGE_SIZE, Page, PageNo};

use super::leaf::MINI_HEADER_BYTES;

/// The size of a tree's leaf pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeafGeometry {
    /// Store pages per leaf page: 1, 2, 4 or 8.
    pages: usize,
}

impl LeafGeometry {
    /// Leaf pages of `bytes` (a multiple of 4 KiB, at most 32 KiB, as
    /// `Config::validate` checks).
    pub(crate) fn new(bytes: usize) -> LeafGeometry {
        debug_assert!(bytes.is_multiple_of(PAGE_SIZE) && (1..=8).contains(&(bytes / PAGE_SIZE)));
        LeafGeometry {
            pages: (bytes / PAGE_SIZE).clamp(1, 8),
        }
    }

    /// Store pages per leaf page.
    pub(crate) fn pages(self) -> usize {
        self.pages
    }

    /// Bytes of a leaf page's node: the payloads of its store pages.
    pub(crate) fn node_bytes(self) -> usize {
        self.pages * PAGE_PAYLOAD_SIZE
    }

    /// The largest mini-page block payload: a full mirror of a leaf page (its node)
    /// after the mini-page header.
    pub(crate) fn max_mini_block_bytes(self) -> usize {
        MINI_HEADER_BYTES + self.node_bytes()
    }

    /// The block of the mirror a writer keeps of the open end of a sorted-order split
    /// (the largest pool block): two leaf pages' worth, so that the pages split off it
    /// are packed full even when the open end is unbounded and so stores its keys
    /// whole.
    pub(crate) fn open_end_mirror_bytes(self) -> usize {
        2 * self.max_mini_block_bytes()
    }

    /// A leaf page of zero bytes of this size.
    pub(crate) fn page(self) -> LeafPage {
        if self.pages == 1 {
            LeafPage::One(Page::boxed())
        } else {
            LeafPage::Wide {
                pages: (0..self.pages).map(|_| Page::boxed()).collect(),
                node: vec![0u8; self.node_bytes()].into_boxed_slice(),
            }
        }
    }
}

/// One leaf page's bytes (module docs).
pub(crate) enum LeafPage {
    /// A leaf of one store page: the node is its payload.
    One(Box<Page>),
    /// A leaf of several store pages, and its node, gathered from their payloads.
    Wide {
        pages: Vec<Box<Page>>,
        node: Box<[u8]>,
    },
}

impl LeafPage {
    /// The leaf's node.
    pub(crate) fn payload(&self) -> &[u8] {
        match self {
            LeafPage::One(page) => page.payload(),
            LeafPage::Wide { node, .. } => node,
        }
    }

    /// The leaf's node, to build.
    pub(crate) fn payload_mut(&mut self) -> &mut [u8] {
        match self {
            LeafPage::One(page) => page.payload_mut(),
            LeafPage::Wide { node, .. } => node,
        }
    }

    /// The page-store requests that read or write this leaf as leaf page `no`: its store
    /// pages `no`, `no + 1`, ... Call [`LeafPage::scatter`] before a write and
    /// [`LeafPage::gather`] after a read.
    pub(crate) fn requests(&mut self, no: PageNo) -> impl Iterator<Item = (PageNo, &mut Page)> {
        let pages: &mut [Box<Page>] = match self {
            LeafPage::One(page) => std::slice::from_mut(page),
            LeafPage::Wide { pages, .. } => pages,
        };
        pages
            .iter_mut()
            .enumerate()
            .map(move |(i, page)| (PageNo(no.0 + i as u64), &mut **page))
    }

    /// Copies the store pages' payloads into the node (after a read).
    pub(crate) fn gather(&mut self) {
        if let LeafPage::Wide { pages, node } = self {
            for (page, part) in pages.iter().zip(node.chunks_mut(PAGE_PAYLOAD_SIZE)) {
                part.copy_from_slice(page.payload());
            }
        }
    }

    /// Copies the node into the store pages' payloads (before a write).
    pub(crate) fn scatter(&mut self) {
        if let LeafPage::Wide { pages, node } = self {
            for (page, part) in pages.iter_mut().zip(node.chunks(PAGE_PAYLOAD_SIZE)) {
                page.payload_mut().copy_from_slice(part);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wide_leaf_is_its_pages_payloads_in_order() {
        let geometry = LeafGeometry::new(4 * PAGE_SIZE);
        assert_eq!(geometry.node_bytes(), 4 * PAGE_PAYLOAD_SIZE);
        let mut leaf = geometry.page();
        for (i, b) in leaf.payload_mut().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        leaf.scatter();
        let mut copy = geometry.page();
        let pages: Vec<(PageNo, Vec<u8>)> = leaf
            .requests(PageNo(8))
            .map(|(no, page)| (no, page.payload().to_vec()))
            .collect();
        assert_eq!(
            pages.iter().map(|(no, _)| no.0).collect::<Vec<_>>(),
            [8, 9, 10, 11]
        );
        for ((_, page), (_, bytes)) in copy.requests(PageNo(8)).zip(&pages) {
            page.payload_mut().copy_from_slice(bytes);
        }
        copy.gather();
        assert_eq!(copy.payload(), leaf.payload());
    }

    #[test]
    fn a_one_page_leaf_is_its_page_payload() {
        let geometry = LeafGeometry::new(PAGE_SIZE);
        assert_eq!(geometry.max_mini_block_bytes(), PAGE_SIZE);
        let mut leaf = geometry.page();
        leaf.payload_mut()[0] = 7;
        let (no, page) = leaf.requests(PageNo(3)).next().unwrap();
        assert_eq!((no, page.payload()[0]), (PageNo(3), 7));
    }
}
