"""`MPI.Exception` and MPI's error classes: MPICH's numbers and strings, so that scripts that print
them, or compare `error_class` with `MPI.ERR_TRUNCATE`, see what they see under mpi4py + MPICH.
"""

from __future__ import annotations

SUCCESS = 0
ERROR_CLASSES: dict[str, tuple[int, str]] = {
    "ERR_BUFFER": (1, "Invalid buffer pointer"),
    "ERR_COUNT": (2, "Invalid count"),
    "ERR_TYPE": (3, "Invalid datatype"),
    "ERR_TAG": (4, "Invalid tag"),
    "ERR_COMM": (5, "Invalid communicator"),
    "ERR_RANK": (6, "Invalid rank"),
    "ERR_ROOT": (7, "Invalid root"),
    "ERR_GROUP": (8, "Invalid group"),
    "ERR_OP": (9, "Invalid MPI_Op"),
    "ERR_TOPOLOGY": (10, "Invalid topology"),
    "ERR_DIMS": (11, "Invalid dimension argument"),
    "ERR_ARG": (12, "Invalid argument"),
    "ERR_PROC_FAILED": (13, "Unknown error.  Please file a bug report."),
    "ERR_PROC_FAILED_PENDING": (13, "Unknown error.  Please file a bug report."),
    "ERR_REVOKED": (13, "Unknown error.  Please file a bug report."),
    "ERR_UNKNOWN": (13, "Unknown error.  Please file a bug report."),
    "ERR_TRUNCATE": (14, "Message truncated"),
    "ERR_OTHER": (15, "Other MPI error"),
    "ERR_INTERN": (16, "Internal MPI error!"),
    "ERR_IN_STATUS": (17, "See the MPI_ERROR field in MPI_Status for the error code"),
    "ERR_PENDING": (18, "Pending request (no error)"),
    "ERR_REQUEST": (19, "Invalid MPI_Request"),
    "ERR_ACCESS": (20, "Access denied to file"),
    "ERR_AMODE": (21, "Invalid amode value in MPI_File_open"),
    "ERR_BAD_FILE": (22, "Invalid file name"),
    "ERR_CONVERSION": (23, "An error occurred in a user-defined data conversion function"),
    "ERR_DUP_DATAREP": (24, "The requested datarep name has already been specified to MPI_REGISTER_DATAREP"),
    "ERR_FILE_EXISTS": (25, "File exists"),
    "ERR_FILE_IN_USE": (26, "File in use by some process"),
    "ERR_FILE": (27, "Invalid MPI_File"),
    "ERR_INFO": (28, "Invalid MPI_Info"),
    "ERR_INFO_KEY": (29, "Invalid key for MPI_Info"),
    "ERR_INFO_VALUE": (30, "Invalid MPI_Info value"),
    "ERR_INFO_NOKEY": (31, "MPI_Info key is not defined"),
    "ERR_IO": (32, "Other I/O error"),
    "ERR_NAME": (33, "Invalid service name (see MPI_Publish_name)"),
    "ERR_NO_MEM": (34, "Unable to allocate memory for MPI_Alloc_mem"),
    "ERR_NOT_SAME": (35, "Inconsistent arguments to collective routine"),
    "ERR_NO_SPACE": (36, "Not enough space for file"),
    "ERR_NO_SUCH_FILE": (37, "File does not exist"),
    "ERR_PORT": (38, "Invalid port"),
    "ERR_QUOTA": (39, "Quota exceeded for files"),
    "ERR_READ_ONLY": (40, "Read-only file or filesystem name"),
    "ERR_SERVICE": (41, "Attempt to lookup an unknown service name"),
    "ERR_SPAWN": (42, "Error in spawn call"),
    "ERR_UNSUPPORTED_DATAREP": (43, "Unsupported datarep passed to MPI_File_set_view"),
    "ERR_UNSUPPORTED_OPERATION": (44, "Unsupported file operation"),
    "ERR_WIN": (45, "Invalid MPI_Win"),
    "ERR_BASE": (46, "Invalid base address"),
    "ERR_LOCKTYPE": (47, "Invalid locktype argument"),
    "ERR_KEYVAL": (48, "Invalid keyval"),
    "ERR_RMA_CONFLICT": (49, "Conflicting accesses to window"),
    "ERR_RMA_SYNC": (50, "Wrong synchronization of RMA calls"),
    "ERR_SIZE": (51, "Invalid size argument in RMA call"),
    "ERR_DISP": (52, "Invalid displacement argument in RMA call"),
    "ERR_ASSERT": (53, "Invalid assert argument"),
    "ERR_RMA_RANGE": (55, "Target memory is not contained within the window"),
    "ERR_RMA_ATTACH": (56, "Memory cannot be attached"),
    "ERR_RMA_SHARED": (57, "Memory cannot be shared"),
    "ERR_RMA_FLAVOR": (58, "Incorrect window flavor"),
    "ERR_SESSION": (75, "Invalid MPI_Session handle"),
    "ERR_PROC_ABORTED": (76, "Process was aborted"),
    "ERR_VALUE_TOO_LARGE": (77, "Value is too large to store"),
    "ERR_ERRHANDLER": (80, "Invalid errhandler"),
    "ERR_ABI": (1073741823, "Last error code"),
    "ERR_LASTCODE": (1073741823, "Last error code"),
}
_STRINGS = {code: text for code, text in ERROR_CLASSES.values()}
ERR_OTHER = ERROR_CLASSES["ERR_OTHER"][0]
ERR_UNKNOWN = ERROR_CLASSES["ERR_UNKNOWN"][0]
ERR_ARG, ERR_COMM = ERROR_CLASSES["ERR_ARG"][0], ERROR_CLASSES["ERR_COMM"][0]
ERR_GROUP = ERROR_CLASSES["ERR_GROUP"][0]
ERR_INFO, ERR_INFO_NOKEY = ERROR_CLASSES["ERR_INFO"][0], ERROR_CLASSES["ERR_INFO_NOKEY"][0]
ERR_KEYVAL = ERROR_CLASSES["ERR_KEYVAL"][0]


def Get_error_string(errorcode: int) -> str:
    """The text of an error code ("No MPI error" for MPI.SUCCESS)."""
    if errorcode == SUCCESS:
        return "No MPI error"
    return _STRINGS.get(errorcode, f"Unknown MPI error code {errorcode}")


def Get_error_class(errorcode: int) -> int:
    """The error class of an error code: every code of the facade is its own class."""
    return int(errorcode)


class MPIException(RuntimeError):
    """An MPI error (mpi4py's MPI.Exception), which compares and hashes as its error code.

    Args:
        ierr: an error code (MPI.ERR_*; below MPI.SUCCESS: MPI.ERR_UNKNOWN), or a message (the
            error class is then MPI.ERR_OTHER).
        message: the text to show instead of the code's standard one.
    """

    def __init__(self, ierr: int | str = SUCCESS, message: str | None = None) -> None:
        super().__init__(ierr) if message is None else super().__init__(ierr, message)
        if isinstance(ierr, int):
            self._code = ierr if ierr >= SUCCESS else ERR_UNKNOWN
            self._text = Get_error_string(self._code) if message is None else message
        else:
            self._code, self._text = ERR_OTHER, str(ierr)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"MPI.Exception({self.args[0]!r})"

    def __int__(self) -> int:
        return self.error_code

    def __hash__(self) -> int:
        return hash(self.error_code)

    def __bool__(self) -> bool:
        return self.error_code != SUCCESS

    def _other(self, other: object) -> int | None:
        if isinstance(other, MPIException):
            return other.error_code
        return int(other) if isinstance(other, int) else None

    def __eq__(self, other: object) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.error_code == value

    def __lt__(self, other: object) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.error_code < value

    def __le__(self, other: object) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.error_code <= value

    def __gt__(self, other: object) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.error_code > value

    def __ge__(self, other: object) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.error_code >= value

    @property
    def error_code(self) -> int:
        """The error code (MPI.ERR_*)."""
        return self._code

    @property
    def error_class(self) -> int:
        """The error class (MPI.ERR_*)."""
        return Get_error_class(self.error_code)

    @property
    def error_string(self) -> str:
        """The error's text."""
        return self._text

    def Get_error_code(self) -> int:
        """The error code."""
        return self.error_code

    def Get_error_class(self) -> int:
        """The error class (MPI.ERR_*)."""
        return self.error_class

    def Get_error_string(self) -> str:
        """The error's text."""
        return self._text
