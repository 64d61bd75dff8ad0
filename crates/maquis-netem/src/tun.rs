//! TUN devices opened with a virtio-net header so the kernel can hand over
//! (and accept) 64 KB GSO segments instead of MTU-sized packets.
//!
//! Every frame read from or written to a [`Tun`] starts with a
//! [`VNET_HDR_LEN`]-byte `struct virtio_net_hdr` followed by the IP packet.
//! The wire never interprets the header: it is carried from the reading
//! device to the writing device unchanged, which is what keeps checksum
//! offload and TSO working end to end.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::NetemError;

/// Path of the TUN clone device.
pub const TUN_PATH: &str = "/dev/net/tun";

/// Length of the virtio-net header that precedes every frame.
pub const VNET_HDR_LEN: usize = 10;

/// Largest frame a read can return: header plus a 64 KB GSO segment, with
/// slack.
pub const MAX_FRAME: usize = VNET_HDR_LEN + 65_536 + 256;

/// An open, non-blocking TUN device in `IFF_TUN | IFF_NO_PI | IFF_VNET_HDR`
/// mode. The device exists as long as this value (its file descriptor) does.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
}

#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Tun {
    /// Creates TUN device `name` in the calling thread's network namespace.
    ///
    /// With `offload`, checksum and TSO offloads (`TUN_F_CSUM | TUN_F_TSO4 |
    /// TUN_F_TSO6`) are enabled so the kernel passes large GSO segments;
    /// without it they are explicitly cleared (offload flags persist on a
    /// device, so they are always set on attach).
    pub fn create(name: &str, offload: bool) -> Result<Tun, NetemError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', '\0']) {
            return Err(NetemError::InvalidConfig(format!(
                "bad interface name {name:?} (1..15 bytes, no '/', space or NUL)"
            )));
        }
        if !Path::new(TUN_PATH).exists() {
            return Err(NetemError::NoTunDevice {
                path: TUN_PATH.into(),
            });
        }
        let path = c"/dev/net/tun";
        let fd = open_rw(path)?;

        let mut ifr = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        for (dst, src) in ifr.name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        // SAFETY: fd is a valid open TUN clone fd; ifr is a properly sized
        // and initialised `struct ifreq` prefix (name + flags + padding).
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
        if rc < 0 {
            return Err(NetemError::io(
                format!("TUNSETIFF {name}"),
                io::Error::last_os_error(),
            ));
        }

        let hdr_len: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one c_int through the pointer.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) };
        if rc < 0 {
            return Err(NetemError::io(
                format!("TUNSETVNETHDRSZ {name}"),
                io::Error::last_os_error(),
            ));
        }

        let flags: libc::c_uint = if offload {
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6
        } else {
            0
        };
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        let rc =
            unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, flags as libc::c_ulong) };
        if rc < 0 {
            return Err(NetemError::io(
                format!("TUNSETOFFLOAD {name}"),
                io::Error::last_os_error(),
            ));
        }

        Ok(Tun { fd })
    }

    /// Reads one frame into the spare capacity of `buf` (which is cleared
    /// first). Returns `Ok(false)` when nothing is pending.
    pub fn recv_vec(&self, buf: &mut Vec<u8>) -> io::Result<bool> {
        buf.clear();
        if buf.capacity() < MAX_FRAME {
            buf.reserve(MAX_FRAME);
        }
        loop {
            let spare = buf.spare_capacity_mut();
            // SAFETY: spare is valid for writes of spare.len() bytes; read(2)
            // initialises exactly the n bytes it reports.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    spare.as_mut_ptr().cast::<libc::c_void>(),
                    spare.len(),
                )
            };
            if n >= 0 {
                // SAFETY: the kernel initialised the first n bytes.
                unsafe { buf.set_len(n as usize) };
                return Ok(true);
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(false),
                _ => return Err(err),
            }
        }
    }

    /// Writes one frame (virtio-net header + IP packet) into the device,
    /// which delivers it to its namespace's network stack.
    pub fn send(&self, frame: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: frame is valid for reads of frame.len() bytes.
            let n = unsafe {
                libc::write(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast::<libc::c_void>(),
                    frame.len(),
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn open_rw(path: &CStr) -> Result<OwnedFd, NetemError> {
    // SAFETY: path is NUL-terminated; the returned fd is checked below.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return Err(if err.kind() == io::ErrorKind::NotFound {
            NetemError::NoTunDevice {
                path: TUN_PATH.into(),
            }
        } else {
            NetemError::io(format!("open {}", path.to_string_lossy()), err)
        });
    }
    // SAFETY: fd is a freshly opened descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The destination IPv4 address of a frame (after the virtio-net header),
/// or `None` for non-IPv4 or truncated frames.
pub fn frame_ipv4_dst(frame: &[u8]) -> Option<[u8; 4]> {
    let ip = frame.get(VNET_HDR_LEN..)?;
    if ip.first()? >> 4 != 4 {
        return None;
    }
    let dst = ip.get(16..20)?;
    Some([dst[0], dst[1], dst[2], dst[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dst_parsing() {
        let mut f = vec![0u8; VNET_HDR_LEN + 20];
        f[VNET_HDR_LEN] = 0x45;
        f[VNET_HDR_LEN + 16..VNET_HDR_LEN + 20].copy_from_slice(&[10, 77, 0, 2]);
        assert_eq!(frame_ipv4_dst(&f), Some([10, 77, 0, 2]));
        f[VNET_HDR_LEN] = 0x60;
        assert_eq!(frame_ipv4_dst(&f), None);
        assert_eq!(frame_ipv4_dst(&f[..VNET_HDR_LEN + 10]), None);
        assert_eq!(frame_ipv4_dst(&[]), None);
    }
}
