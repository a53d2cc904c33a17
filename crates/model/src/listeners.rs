//! Pulsar's advertised listeners: a broker reachable under several names (an internal network,
//! an external one, ...), each with its own `pulsar://` and `pulsar+ssl://` URL. A client that
//! names a listener (`listenerName`, LOOKUP's `advertised_listener_name`) is answered that
//! listener's URLs; one that names none, the internal listener's.
//!
//! The configuration is Pulsar's `advertisedListeners`
//! (`internal:pulsar://10.0.0.1:6650,internal:pulsar+ssl://10.0.0.1:6651,external:pulsar://…`)
//! and `internalListenerName` (default: the first listener named), checked with the rules and
//! messages of Pulsar's `MultipleListenerValidator`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One listener's URLs (at most one of each scheme; `http` and `https` ones are kept too). As
/// JSON, Pulsar's `AdvertisedListener` (a broker's registration carries its listeners so that
/// every broker answers lookups of its topics with them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    #[serde(rename = "brokerServiceUrl", default, skip_serializing_if = "Option::is_none")]
    pub broker_url: Option<String>,
    #[serde(rename = "brokerServiceUrlTls", default, skip_serializing_if = "Option::is_none")]
    pub broker_url_tls: Option<String>,
    #[serde(rename = "brokerHttpUrl", default, skip_serializing_if = "Option::is_none")]
    pub web_url: Option<String>,
    #[serde(rename = "brokerHttpsUrl", default, skip_serializing_if = "Option::is_none")]
    pub web_url_tls: Option<String>,
}

/// The listeners by name, and which is the internal one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvertisedListeners {
    #[serde(default)]
    pub listeners: BTreeMap<String, Listener>,
    #[serde(default)]
    pub internal: Option<String>,
}

impl AdvertisedListeners {
    /// Parses `advertisedListeners` and `internalListenerName` (empty: none given). An empty
    /// `advertised` is no listeners at all.
    pub fn parse(advertised: &str, internal: &str) -> Result<AdvertisedListeners, String> {
        let mut parsed = AdvertisedListeners::default();
        if advertised.trim().is_empty() {
            return Ok(parsed);
        }
        // host:port → the listener that has it: one address may serve one listener only.
        let mut addresses: BTreeMap<String, String> = BTreeMap::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut first = None;
        for entry in advertised.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((name, url)) = entry.split_once(':').filter(|(n, _)| !n.trim().is_empty())
            else {
                return Err(format!(
                    "the configure entry `advertisedListeners` is invalid. because {entry} do \
                     not contain listener name"
                ));
            };
            let (name, url) = (name.trim().to_string(), url.trim());
            first.get_or_insert_with(|| name.clone());
            let count = counts.entry(name.clone()).or_default();
            *count += 1;
            if *count > 2 {
                return Err(format!("there are redundant configure for listener `{name}`"));
            }
            let invalid =
                || format!("the value {url} in the `advertisedListeners` configure is invalid");
            let (scheme, rest) = url.split_once("://").ok_or_else(invalid)?;
            let address = rest.trim_end_matches('/');
            let (host, port) = address.rsplit_once(':').ok_or_else(invalid)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(invalid());
            }
            if let Some(other) = addresses.get(address).filter(|other| **other != name) {
                let _ = other;
                return Err(invalid());
            }
            addresses.insert(address.to_string(), name.clone());
            let listener = parsed.listeners.entry(name).or_default();
            let slot = match scheme {
                "pulsar" => &mut listener.broker_url,
                "pulsar+ssl" => &mut listener.broker_url_tls,
                "http" => &mut listener.web_url,
                "https" => &mut listener.web_url_tls,
                // Pulsar ignores other schemes.
                _ => continue,
            };
            if slot.is_some() {
                return Err(invalid());
            }
            *slot = Some(url.to_string());
        }
        let internal = match internal.trim() {
            "" => first,
            name => Some(name.to_string()),
        };
        if let Some(name) = &internal {
            if !parsed.listeners.contains_key(name) {
                return Err("the `advertisedListeners` configure do not contain \
                            `internalListenerName` entry"
                    .to_string());
            }
        }
        parsed.internal = internal;
        Ok(parsed)
    }

    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty()
    }

    /// The listener a client names, or (none named) the internal one. `Err` with Pulsar's
    /// message (which clients match on) when the broker has no listener of that name.
    pub fn select(&self, name: Option<&str>) -> Result<Option<&Listener>, String> {
        match name.map(str::trim).filter(|n| !n.is_empty()) {
            Some(name) => self
                .listeners
                .get(name)
                .map(Some)
                .ok_or_else(|| format!("the broker do not have {name} listener")),
            None => Ok(self.internal.as_ref().and_then(|name| self.listeners.get(name))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_parse_with_the_first_as_internal() {
        let parsed = AdvertisedListeners::parse(
            "internal:pulsar://10.0.0.1:6650, internal:pulsar+ssl://10.0.0.1:6651,\
             external:pulsar://broker.example:16650",
            "",
        )
        .unwrap();
        assert_eq!(parsed.internal.as_deref(), Some("internal"));
        let internal = &parsed.listeners["internal"];
        assert_eq!(internal.broker_url.as_deref(), Some("pulsar://10.0.0.1:6650"));
        assert_eq!(internal.broker_url_tls.as_deref(), Some("pulsar+ssl://10.0.0.1:6651"));
        let external = parsed.select(Some("external")).unwrap().unwrap();
        assert_eq!(external.broker_url.as_deref(), Some("pulsar://broker.example:16650"));
        assert_eq!(parsed.select(None).unwrap(), Some(internal));
        assert_eq!(
            parsed.select(Some("test")).unwrap_err(),
            "the broker do not have test listener"
        );
        assert!(AdvertisedListeners::parse("", "").unwrap().select(Some("test")).is_err());
        assert_eq!(AdvertisedListeners::parse("", "").unwrap().select(None), Ok(None));
    }

    #[test]
    fn pulsars_validation_rules() {
        let err = |a: &str, i: &str| AdvertisedListeners::parse(a, i).unwrap_err();
        assert!(err(":pulsar://h:1", "").contains("do not contain listener name"), "no name");
        // Without a name the scheme is taken for one, and what is left is no URL.
        assert!(err("pulsar://h:1", "").contains("the value //h:1 in the `advertisedListeners`"));
        assert!(err("a:pulsar://h:1,a:pulsar+ssl://h:2,a:http://h:3", "")
            .contains("redundant configure for listener `a`"));
        assert!(err("a:pulsar://h:1,a:pulsar://h:2", "").contains("is invalid"), "two pulsar://");
        assert!(err("a:pulsar://h:1,b:pulsar://h:1", "").contains("is invalid"), "same address");
        assert!(err("a:pulsar://h", "").contains("is invalid"), "no port");
        assert!(err("a:pulsar://h:1", "b").contains("internalListenerName"));
        let named = AdvertisedListeners::parse("a:pulsar://h:1,b:pulsar://g:1", "b").unwrap();
        assert_eq!(named.internal.as_deref(), Some("b"));
    }
}
