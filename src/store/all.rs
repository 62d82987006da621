//! Several limits of one call (`RL.ALL`, `RL.SETTLE`), each on its own key and of either shape,
//! decided at one instant and written all or none.

use crate::codec::error::ErrorReply;
use crate::core::Reply;
use crate::store::{Limit, Store};

/// The outcome of a multi-limit call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllReply {
    pub allowed: bool,
    /// 1-based position of the first limit that denied; 0 when all admitted.
    pub denied_by: usize,
    pub replies: Vec<Reply>,
}

/// Admits only if every limit admits, consuming from all or none. Limits are decided in order
/// at one instant (the first bad key's error is the reply), then written only if all admit. A
/// limit that would admit while another denies reports its unconsumed state (a peek).
pub fn apply_all(
    limits: &mut [Box<dyn Limit>],
    stores: &mut [&mut dyn Store],
    now_us: i64,
) -> Result<AllReply, ErrorReply> {
    let mut replies: Vec<Reply> = Vec::with_capacity(limits.len());
    for (limit, store) in limits.iter_mut().zip(stores.iter()) {
        replies.push(limit.decide(&**store, now_us)?);
    }
    let denied_by = replies.iter().position(|r| !r.allowed).map_or(0, |i| i + 1);
    if denied_by == 0 {
        // Whether the call may write is decided once, before the first write (memory is one
        // server's, whichever key asks): all limits are written or none.
        if limits.iter().any(|l| l.writes())
            && let Some(first) = stores.first()
        {
            first.writable()?;
        }
        for (limit, store) in limits.iter().zip(stores.iter_mut()) {
            limit.commit(&mut **store)?;
        }
    } else {
        for ((reply, limit), store) in replies.iter_mut().zip(limits.iter()).zip(stores.iter()) {
            if reply.allowed {
                *reply = limit.peek(&**store, now_us)?;
            }
        }
    }
    Ok(AllReply {
        allowed: denied_by == 0,
        denied_by,
        replies,
    })
}
