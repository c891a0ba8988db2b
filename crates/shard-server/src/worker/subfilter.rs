//! `sub_filter` for a response: the location's pairs rendered for the request
//! (`shard_http::subfilter` does the matching). Responses made in memory (`return`, error
//! pages) and static files are filtered whole (`respond.rs`); proxied bodies as they stream
//! (`proxy.rs`).

use shard_config::LocationConf;
use shard_http::request::Request;
use shard_http::subfilter::SubFilter;

use super::Worker;

impl Worker<'_> {
    /// The filter of a response of `content_type` in `loc`, when its `sub_filter` applies
    /// and some pattern is left once rendered.
    pub(super) fn sub_filter_for(
        &self,
        key: usize,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
        content_type: &str,
    ) -> Option<SubFilter> {
        if !loc.sub_filter.applies_to(content_type) {
            return None;
        }
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let ctx = self.var_ctx(key, req, hs, loc);
        let pairs = loc
            .sub_filter
            .pairs
            .iter()
            .map(|(p, r)| {
                let mut pat = Vec::new();
                shard_http::vars::push_parts(&mut pat, p, &ctx);
                let mut rep = Vec::new();
                shard_http::vars::push_parts(&mut rep, r, &ctx);
                (pat, rep)
            })
            .collect();
        SubFilter::new(pairs, loc.sub_filter.once)
    }
}
