//! How much room a connection's buffers hold: one rule for the client side and the site
//! side alike.
//!
//! A read is made into the room a buffer has left, and the buffer grows only when that
//! room runs low: the head and body bytes taken from a buffer stay shared with it while
//! they live, so reserving before every read would allocate a new buffer each time. A
//! streamed answer holds its two connections for seconds to minutes and carries one
//! small event at a time, so while reads or writes come small, room past
//! [`STREAM_KEEP`] is given back, and it grows again when a burst needs it.

use bytes::BytesMut;

/// Room a read buffer grows by when it runs low.
pub(crate) const READ_RESERVE: usize = 8 * 1024;

/// The least room a read is made into: below it the buffer grows first.
pub(crate) const READ_MIN_ROOM: usize = 1024;

/// Most room a buffer keeps while its connection streams small events, and what a read
/// buffer grows by while its reads trickle: [`READ_RESERVE`] held per open stream would
/// be memory kept for nothing.
pub(crate) const STREAM_KEEP: usize = 1024;

/// How a connection's reads have been coming: what its read buffer grows by, and whether
/// its room is given back between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Pace {
    /// Reads come as large as the room: a request, a plain answer, a burst.
    #[default]
    Bursts,
    /// The last read took less than [`STREAM_KEEP`]: the peer trickles events.
    Trickle,
}

impl Pace {
    /// The pace a read of `n` bytes shows.
    pub(crate) fn of(n: usize) -> Self {
        if n < STREAM_KEEP {
            Self::Trickle
        } else {
            Self::Bursts
        }
    }
}

/// Makes room for the next read into `buf`: below [`READ_MIN_ROOM`] it grows by
/// [`READ_RESERVE`], or by [`STREAM_KEEP`] while reads trickle.
pub(crate) fn make_read_room(buf: &mut BytesMut, pace: Pace) {
    if buf.capacity() - buf.len() < READ_MIN_ROOM {
        buf.reserve(match pace {
            Pace::Bursts => READ_RESERVE,
            Pace::Trickle => STREAM_KEEP,
        });
    }
}

/// Gives back an emptied buffer's room past [`STREAM_KEEP`] (bytes taken from it and still
/// alive keep the old allocation until they are dropped; bytes not yet used keep the
/// buffer).
pub(crate) fn release_room(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > STREAM_KEEP {
        *buf = BytesMut::new();
    }
}

/// After a batch of `batch` bytes was written from `out` with more of the answer to come:
/// a small batch says the answer streams, so `out` holds no more room than its events need
/// (a large body keeps its room).
pub(crate) fn keep_stream_room(out: &mut BytesMut, batch: usize) {
    if batch <= STREAM_KEEP && out.capacity() > STREAM_KEEP {
        *out = BytesMut::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_of_stream_keep_bytes_is_a_burst_and_one_byte_less_a_trickle() {
        assert_eq!(Pace::of(STREAM_KEEP), Pace::Bursts);
        assert_eq!(Pace::of(STREAM_KEEP - 1), Pace::Trickle);
        assert_eq!(Pace::of(0), Pace::Trickle);
    }

    #[test]
    fn a_buffer_with_read_min_room_left_reads_into_it_and_one_byte_less_grows_it_by_the_pace() {
        let mut buf = BytesMut::with_capacity(READ_MIN_ROOM);
        make_read_room(&mut buf, Pace::Bursts);
        assert_eq!(buf.capacity(), READ_MIN_ROOM, "enough room is read into");

        let mut buf = BytesMut::with_capacity(READ_MIN_ROOM - 1);
        make_read_room(&mut buf, Pace::Bursts);
        assert!(buf.capacity() >= READ_RESERVE, "{}", buf.capacity());

        let mut buf = BytesMut::with_capacity(READ_MIN_ROOM - 1);
        make_read_room(&mut buf, Pace::Trickle);
        assert!(
            (STREAM_KEEP..READ_RESERVE).contains(&buf.capacity()),
            "a trickle grows by the kept room only: {}",
            buf.capacity()
        );
    }

    #[test]
    fn an_empty_buffer_keeps_stream_keep_of_room_and_gives_back_more() {
        let mut buf = BytesMut::with_capacity(STREAM_KEEP);
        release_room(&mut buf);
        assert_eq!(buf.capacity(), STREAM_KEEP);
        let mut buf = BytesMut::with_capacity(STREAM_KEEP + 1);
        release_room(&mut buf);
        assert_eq!(buf.capacity(), 0);
        // Bytes not yet used (a pipelined request, the rest of an event) keep their buffer.
        let mut buf = BytesMut::with_capacity(4 * STREAM_KEEP);
        buf.extend_from_slice(b"G");
        release_room(&mut buf);
        assert_eq!(buf.capacity(), 4 * STREAM_KEEP);
    }

    #[test]
    fn a_streamed_batch_of_stream_keep_gives_back_the_room_and_one_byte_more_keeps_it() {
        let mut out = BytesMut::with_capacity(4 * STREAM_KEEP);
        keep_stream_room(&mut out, STREAM_KEEP);
        assert_eq!(out.capacity(), 0, "a batch of the kept size streams");
        let mut out = BytesMut::with_capacity(4 * STREAM_KEEP);
        keep_stream_room(&mut out, STREAM_KEEP + 1);
        assert_eq!(
            out.capacity(),
            4 * STREAM_KEEP,
            "a larger batch keeps its room"
        );
        let mut out = BytesMut::with_capacity(STREAM_KEEP);
        keep_stream_room(&mut out, 1);
        assert_eq!(out.capacity(), STREAM_KEEP, "the kept size itself is kept");
    }
}
