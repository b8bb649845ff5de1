//! UDP segmentation and receive offload (Linux `UDP_SEGMENT` since 4.18,
//! `UDP_GRO` since 5.0): the bulk half of "close to the limit"
//! (docs/ARCHITECTURE.md, "Segmentation offload").
//!
//! A bulk stream leaves as runs of equal datagrams to one peer, each at
//! the path's size (1,472 bytes on an Ethernet link). Sent one by one,
//! every datagram walks the whole UDP and IP stack. With segmentation
//! offload a run goes down the stack once, as one buffer with the size of
//! its segments, and is cut into datagrams at the device (or by the NIC);
//! with receive offload the kernel hands a receiver such a run back whole,
//! with the segment size, so it comes up the stack once too. What goes on
//! the wire is the same datagrams, each whole, so a peer without either
//! sees nothing different: the kernel cuts a run for a socket that did
//! not ask for runs.
//!
//! - A run is what the kernel takes as one send: one destination, every
//!   datagram the size of the first but the last, which may be shorter,
//!   at most `MAX_SEGMENTS` of them and `MAX_RUN` bytes in all.
//! - A kernel or device that cannot segment says so at the first run
//!   (`EIO`: no checksum offload on the route's device); the transport
//!   sends that run again one datagram at a time, and never segments again.
//! - A coalesced run needs a receive slot of `COALESCED_SLOT` bytes, or the
//!   kernel cuts it to the slot: the transport turns receive offload on
//!   only while it is given slots that large.

use std::os::fd::RawFd;

use crate::NodeId;

/// Datagrams a run carries at most: the kernel's `UDP_MAX_SEGMENTS` (64,
/// raised to 128 in recent kernels), and one `sendmmsg` batch.
pub(crate) const MAX_SEGMENTS: usize = 64;

/// Bytes a run carries at most: one UDP datagram's payload over IPv4, which
/// the kernel checks a run's total against.
pub(crate) const MAX_RUN: usize = 65_507;

/// A receive slot large enough for any run the kernel coalesces (it stops
/// before an IP packet's 64 KiB).
pub const COALESCED_SLOT: usize = 65_535;

/// Control-message room for one `u16` or `i32` option, 8-byte aligned.
pub(crate) type Control = [u64; 4];

/// Does the kernel segment runs on this socket (`getsockopt UDP_SEGMENT`
/// answers on kernels that have it)?
pub(crate) fn can_segment(fd: RawFd) -> bool {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a live c_int and its exact size, written by the kernel.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0
}

/// Ask the kernel to hand this socket runs whole (`on`), or each datagram
/// alone.
pub(crate) fn set_coalescing(fd: RawFd, on: bool) -> std::io::Result<()> {
    crate::udp::set_int(&fd, libc::SOL_UDP, libc::UDP_GRO, libc::c_int::from(on))
}

/// How many datagrams from the front of `batch` go as one run: 1 when the
/// second cannot join the first.
pub(crate) fn run_length(batch: &[(NodeId, &[u8])]) -> usize {
    let Some(&(dst, first)) = batch.first() else { return 0 };
    let size = first.len();
    if size == 0 {
        return 1;
    }
    let mut total = size;
    let mut n = 1;
    for &(d, data) in &batch[1..batch.len().min(MAX_SEGMENTS)] {
        if d != dst || data.len() > size || data.is_empty() || total + data.len() > MAX_RUN {
            break;
        }
        total += data.len();
        n += 1;
        // A shorter datagram can only end a run.
        if data.len() < size {
            break;
        }
    }
    n
}

/// Put a `UDP_SEGMENT` control message saying `size` into `control`, and
/// point `hdr` at it.
pub(crate) fn put_segment_size(hdr: &mut libc::msghdr, control: &mut Control, size: u16) {
    hdr.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    hdr.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as _;
    debug_assert!(hdr.msg_controllen <= std::mem::size_of::<Control>());
    // SAFETY: the header points at `control`, 8-byte aligned and large
    // enough for one cmsghdr and a u16 (checked above), so the first
    // header is inside it and its data follows within.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(hdr);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size);
    }
}

/// Of a run received into a slot too small for it (the kernel cut it:
/// `truncated`), the bytes of its whole segments, and whether any was
/// cut; a run that fit, or one datagram (`stride` 0), as it came.
pub(crate) fn cut_to_whole(len: usize, stride: usize, truncated: bool) -> (usize, bool) {
    if !truncated || stride == 0 {
        return (len, false);
    }
    (len / stride * stride, true)
}

/// Point `hdr` at `control` for whatever the kernel says of a receive.
pub(crate) fn expect_control(hdr: &mut libc::msghdr, control: &mut Control) {
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of::<Control>() as _;
}

/// The size of the segments a received run was coalesced from, if the
/// kernel said (a `UDP_GRO` control message); `None` for one datagram.
pub(crate) fn segment_size(hdr: &libc::msghdr) -> Option<usize> {
    if hdr.msg_control.is_null() || hdr.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return None;
    }
    // SAFETY: the header's control buffer is live and the kernel wrote
    // `msg_controllen` bytes of well-formed control messages into it; the
    // CMSG macros stay within that length.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return usize::try_from(size).ok().filter(|&s| s > 0);
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_one_peer_equal_sizes_and_a_shorter_tail() {
        let (a, b, short) = (vec![1u8; 1000], vec![2u8; 1000], vec![3u8; 10]);
        let batch: Vec<(NodeId, &[u8])> = vec![(1, &a), (1, &b), (1, &short), (1, &a)];
        assert_eq!(run_length(&batch), 3, "a shorter datagram ends the run");
        let batch: Vec<(NodeId, &[u8])> = vec![(1, &a), (2, &b)];
        assert_eq!(run_length(&batch), 1, "another peer");
        let batch: Vec<(NodeId, &[u8])> = vec![(1, &short), (1, &a)];
        assert_eq!(run_length(&batch), 1, "a longer one cannot follow");
        let batch: Vec<(NodeId, &[u8])> = vec![(1, &[]), (1, &[])];
        assert_eq!(run_length(&batch), 1, "empty datagrams go alone");
        let big = vec![0u8; 30_000];
        let batch: Vec<(NodeId, &[u8])> = vec![(1, &big); 3];
        assert_eq!(run_length(&batch), 2, "at most a datagram's payload in all");
        let small = vec![0u8; 100];
        let batch: Vec<(NodeId, &[u8])> = vec![(1, &small); 100];
        assert_eq!(run_length(&batch), MAX_SEGMENTS);
        assert_eq!(run_length(&[]), 0);
    }

    #[test]
    fn a_cut_run_keeps_its_whole_segments() {
        assert_eq!(cut_to_whole(2048, 1400, true), (1400, true));
        assert_eq!(cut_to_whole(2048, 3000, true), (0, true), "not one segment fits");
        assert_eq!(cut_to_whole(2048, 0, true), (2048, false), "one datagram is cut as before");
        assert_eq!(cut_to_whole(3000, 1400, false), (3000, false));
    }

    #[test]
    fn a_segment_size_written_is_read_back() {
        // SAFETY: an all-zero msghdr is a valid empty header.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut control: Control = [0; 4];
        assert_eq!(segment_size(&hdr), None, "no control buffer");
        put_segment_size(&mut hdr, &mut control, 1472);
        // SAFETY: as above; the header points at `control`.
        let cmsg = unsafe { &*libc::CMSG_FIRSTHDR(&hdr) };
        assert_eq!((cmsg.cmsg_level, cmsg.cmsg_type), (libc::SOL_UDP, libc::UDP_SEGMENT));
        // A receive's UDP_GRO message carries an int.
        // SAFETY: as above.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&hdr);
            (*cmsg).cmsg_type = libc::UDP_GRO;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), 1472);
        }
        assert_eq!(segment_size(&hdr), Some(1472));
    }
}
